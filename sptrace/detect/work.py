"""Where one rank's work lane was busy, and in which module: what the cross-rank critical path
(sptrace.reduce.critical) walks back through between collectives.

The lane is the rank's GPU compute (every compute kernel of every stream, merged) and, where
the GPU idled, its busiest CPU threads' work (the GPU then waited for the host: its launches,
data loading); on a CPU trace, its busiest threads' work. A thread's work is its CPU ops and
annotations, module ranges and autograd's backward nodes, less the time it spent inside
communication ops (issuing or waiting on a collective is not work).

Each stretch of work is labelled with the innermost module running on the CPU where the work
came from: a kernel at the time and thread of its launch, a CPU stretch where it ran. The module
ranges are sptrace's markers, else the Python stacks' ``nn.Module`` frames; a backward node is
charged to the module of the forward op it differentiates (its sequence number), the optimizer's
ranges to ``optimizer``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sptrace.detect.index import RankIndex, has_prefix, take_columns
from sptrace.detect.kinds import AUTOGRAD_NODE, COMM_CALLS
from sptrace.load.trace import RankTrace
from sptrace.vocab import markers

WORK_COLUMNS = ["rank", "start_us", "dur_us", "module", "phase", "lane"]
"""One stretch of a rank's work on its own clock: ``module`` (None where no module range covers
it), ``phase`` (forward, backward, optimizer, or what sptrace.phase markers name), ``lane`` (gpu
or cpu)."""

NOT_WORK = (*COMM_CALLS, "c10d_functional::wait")
"""CPU ops whose time is communication (issue or wait), never the rank's work."""

_NOT_THREAD_WORK = ("ProfilerStep#", "sptrace.")
"""CPU ranges around the whole step, and sptrace's markers: labels, not work of their own."""

OPTIMIZER = "optimizer"


class ModuleClock:
    """The innermost labelled range at any time on any thread, flattened into disjoint pieces
    per thread (``at`` looks a time up); where none (or one without a name) covers a time, the
    ``fallback`` clock's label."""

    def __init__(
        self, start: np.ndarray, end: np.ndarray, tid: np.ndarray, labels: list[tuple[str | None, str]],
        fallback: ModuleClock | None = None,
    ) -> None:  # fmt: skip
        self.fallback, self.offset = fallback, len(labels)
        self.labels = list(labels) + (fallback.labels if fallback is not None else [])
        self.pieces: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for t in np.unique(tid).tolist():
            at = np.flatnonzero(tid == t)
            s, e, lab = _flatten(start[at], end[at], at)
            self.pieces[int(t)] = (np.asarray(s, np.int64), np.asarray(e, np.int64), np.asarray(lab, np.int64))

    def at(self, ts: np.ndarray, tid: np.ndarray) -> np.ndarray:
        """Each (ts, tid)'s label index, -1 where no range covers it."""
        out = np.full(len(ts), -1, dtype=np.int64)
        for t, (s, e, lab) in self.pieces.items():
            mine = np.flatnonzero(tid == t)
            if not len(mine) or not len(s):
                continue
            i = np.searchsorted(s, ts[mine], side="right") - 1
            ok = (i >= 0) & (ts[mine] < e[np.maximum(i, 0)])
            out[mine[ok]] = lab[i[ok]]
        if self.fallback is not None:
            named = np.array([self.labels[x][0] is not None if x >= 0 else False for x in out.tolist()], dtype=bool)
            ask = np.flatnonzero(~named)
            if len(ask):
                found = self.fallback.at(ts[ask], tid[ask])
                out[ask[found >= 0]] = found[found >= 0] + self.offset
        return out


def _flatten(start: np.ndarray, end: np.ndarray, label: np.ndarray) -> tuple[list[int], list[int], list[int]]:
    """Nested ranges on one thread -> disjoint pieces, each labelled with the innermost range
    covering it. Hand-written: one sweep over the ranges by start (longest first) with a stack of
    the open ones; a range that outlives its parent is cut at the parent's end (pandas and numpy
    have no interval-nesting operation)."""
    order = np.lexsort((-(end - start), start))
    ps: list[int] = []
    pe: list[int] = []
    pl: list[int] = []
    stack: list[tuple[int, int]] = []
    cur = 0

    def emit(a: int, b: int, lab: int) -> None:
        if b > a:
            ps.append(a)
            pe.append(b)
            pl.append(lab)

    for i in order.tolist():
        s, e, lab = int(start[i]), int(end[i]), int(label[i])
        while stack and stack[-1][0] <= s:
            top_end, top_lab = stack.pop()
            emit(cur, top_end, top_lab)
            cur = max(cur, top_end)
        if stack:
            emit(cur, s, stack[-1][1])
            e = min(e, stack[-1][0])
        cur = s
        if e > s:
            stack.append((e, lab))
    while stack:
        top_end, top_lab = stack.pop()
        emit(cur, top_end, top_lab)
        cur = max(cur, top_end)
    return ps, pe, pl


def module_clock(idx: RankIndex, cpu: pd.DataFrame | None = None) -> ModuleClock:
    """The rank's module ranges (forward), backward nodes and optimizer ranges as one clock; its
    threads' outermost CPU ranges where none covers a time (``cpu``: its CPU events)."""
    labels: list[tuple[str | None, str]] = []
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    tids: list[np.ndarray] = []

    def add(ranges, names: list[str | None], phase: str) -> None:
        labels.extend((n, phase) for n in names)
        starts.append(ranges.start)
        ends.append(ranges.end)
        tids.append(ranges.tid)

    ranges = idx.module_markers
    if len(ranges):
        add(ranges, [ranges.name(i)[len(markers.MODULE) :] for i in range(len(ranges))], "forward")
    else:
        frames = idx.python
        keep = [i for i in range(len(frames)) if frames.name(i).startswith("nn.Module: ")]
        ranges = frames.subset(keep)
        add(ranges, [idx.python_module(int(ranges.start[i]), int(ranges.end[i]), int(ranges.tid[i]))
                     for i in range(len(ranges))], "forward")  # fmt: skip
    forward = ModuleClock(*_joined(starts, ends, tids), labels) if labels else None
    nodes = idx.backward_nodes
    if len(nodes):
        add(nodes, _backward_modules(idx, nodes, forward), "backward")
    if len(idx.optimizer):
        add(idx.optimizer, [OPTIMIZER] * len(idx.optimizer), OPTIMIZER)
    if cpu is None:
        cpu = take_columns(idx.events, idx.is_cpu, ["tid", "name", "ts_ns", "dur_ns"])
    outer = _outer_clock(cpu)
    if not labels:
        empty = np.empty(0, np.int64)
        return ModuleClock(empty, empty, empty, [], fallback=outer)
    return ModuleClock(*_joined(starts, ends, tids), labels, fallback=outer)


def _outer_clock(cpu: pd.DataFrame) -> ModuleClock:
    """Each thread's outermost CPU ranges inside the step (annotations such as ``## forward ##``,
    or top-level ops) of ``cpu`` (the rank's CPU events: tid, name, ts_ns, dur_ns): what names
    work that no module range covers (a trace without python stacks or sptrace's markers)."""
    empty = np.empty(0, np.int64)
    keep = ~has_prefix(cpu["name"], (*NOT_WORK, *_NOT_THREAD_WORK)) if len(cpu) else np.zeros(0, dtype=bool)
    if not keep.any():
        return ModuleClock(empty, empty, empty, [])
    tid = cpu["tid"].to_numpy(dtype=np.int64, na_value=-1)[keep]
    start = cpu["ts_ns"].to_numpy(dtype=np.int64, na_value=0)[keep]
    end = start + cpu["dur_ns"].to_numpy(dtype=np.int64, na_value=0)[keep]
    names = cpu["name"].to_numpy(dtype=object)[keep]
    order = np.lexsort((-end, start, tid))
    tid, start, end, names = tid[order], start[order], end[order], names[order]
    top = np.zeros(len(tid), dtype=bool)
    for t in np.unique(tid):  # top level: starts at or after every earlier range on its thread has ended
        at = np.flatnonzero(tid == t)
        reach = np.maximum.accumulate(end[at])
        top[at] = np.concatenate(([True], start[at][1:] >= reach[:-1]))
    # a backward node by its own name: "ConvolutionBackward0", not "autograd::engine::evaluate_function: ..."
    labels = [(str(n).removeprefix(f"{AUTOGRAD_NODE}: "), "") for n in names[top]]
    return ModuleClock(start[top], end[top], tid[top], labels)


def _joined(starts, ends, tids) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.concatenate(starts), np.concatenate(ends), np.concatenate(tids)


def _backward_modules(idx: RankIndex, nodes, forward: ModuleClock | None) -> list[str | None]:
    """Each backward node's module: the forward op of its sequence number, looked up on the
    forward clock; a node that carries no number is asked of RankIndex.module_of (its inner ops')."""
    seqs = nodes.column("seq_num")
    known = seqs.notna().to_numpy()
    out: list[str | None] = [None] * len(nodes)
    if forward is not None:
        found, fts, ftid = idx.forward_ops(seqs.tolist())
        labels = forward.at(fts, ftid)
        for i, lab in zip(np.flatnonzero(found).tolist(), labels.tolist()):
            if lab >= 0:
                out[i] = forward.labels[lab][0]
    for i in np.flatnonzero(~known).tolist():
        out[i] = idx.module_of(int(nodes.start[i]), int(nodes.end[i]), int(nodes.tid[i]))[0]
    return out


def detect_work(
    trace: RankTrace, index: RankIndex | None = None, collectives: pd.DataFrame | None = None,
    max_segments: int = 4000, threads: int = 4,
) -> pd.DataFrame:  # fmt: skip
    """The rank's work lane (module docstring), as labelled stretches (gaps shorter than the
    step's 1/``max_segments`` are closed within one label): the GPU's compute first, then the
    work of its ``threads`` busiest CPU threads where nothing before them covers the time.
    ``collectives``: the rank's (sptrace.detect.collectives): from a collective's issue to the end
    of its transfer, a thread that runs no op is waiting on it, even inside a module's range."""
    idx = index or RankIndex(trace)
    waits = _in_flight(collectives)
    rank = int(trace.rank) if trace.rank is not None else 0
    cpu = take_columns(idx.events, idx.is_cpu, ["tid", "name", "ts_ns", "dur_ns"])
    clock = module_clock(idx, cpu)
    empty = np.empty(0, np.int64)
    cover = (empty, empty, empty, np.empty(0, dtype=bool))
    blocked: tuple[np.ndarray, np.ndarray] = (empty, empty)
    gpu = bool(idx.is_compute_kernel.any())
    if gpu:
        gs, ge, gl = _gpu_lane(idx, clock)
        cover = (gs, ge, gl, np.ones(len(gs), dtype=bool))
        # while an NCCL kernel runs, the GPU is held by the collective, not by the host
        comm = idx.comm_kernels
        blocked = (idx.table.start[comm], idx.table.end[comm])
    # a CPU trace's work is its busiest thread's (another thread's ops there are gloo's workers
    # and the like, which run while the rank waits)
    for tid in cpu["tid"].value_counts().index[: threads if gpu else 1].tolist() if len(cpu) else []:
        ts, te, tl = _thread_work(cpu[cpu["tid"] == tid], int(tid), clock, waits)
        cover = _fill(cover, ts, te, tl, blocked)
    starts, ends, labels, lanes = cover
    if not len(starts):
        return pd.DataFrame(columns=WORK_COLUMNS)
    s, e, lab, lane = _close_gaps(starts, ends, labels, lanes, (ends.max() - starts.min()) / max_segments)
    names = [clock.labels[x] if x >= 0 else (None, "") for x in lab]
    phases = _phases(idx, s, [p for _, p in names])
    # names as categories: a rank's few hundred stretches repeat a few dozen names, and a run's
    # thousand ranks' lanes are all held until the reduce
    return pd.DataFrame({
        "rank": rank, "start_us": s / 1e3, "dur_us": (e - s) / 1e3, "module": _categories([m for m, _ in names]),
        "phase": _categories(phases), "lane": pd.Categorical.from_codes(lane.astype(np.int8), ["cpu", "gpu"]),
    }, columns=WORK_COLUMNS)  # fmt: skip


def _categories(values: list[str | None]) -> pd.Categorical:
    """Names as a categorical (None: missing), by pandas' hash-based factorize."""
    codes, uniques = pd.factorize(np.array(values, dtype=object))
    return pd.Categorical.from_codes(codes, uniques)


def _fill(cover: tuple[np.ndarray, ...], starts: np.ndarray, ends: np.ndarray, labels: np.ndarray,
          blocked: tuple[np.ndarray, np.ndarray]):  # fmt: skip
    """``cover`` (sorted, disjoint stretches with labels and lanes) and the parts of the CPU
    stretches [starts, ends) (sorted, disjoint) that neither it nor ``blocked`` covers, as one
    sorted set. Hand-written: one merge walk of two sorted lists of intervals, keeping each
    part's label."""
    from sptrace.detect.timing import merge_intervals

    if not len(starts):
        return cover
    cs, ce, cl, cg = cover
    taken = merge_intervals(np.concatenate([cs, blocked[0]]), np.concatenate([ce, blocked[1]]))
    ns: list[int] = []
    ne: list[int] = []
    nl: list[int] = []
    j = 0
    cs_l, ce_l = [a for a, _ in taken], [b for _, b in taken]
    for s, e, lab in zip(starts.tolist(), ends.tolist(), labels.tolist()):
        while j < len(cs_l) and ce_l[j] <= s:
            j += 1
        k, cur = j, s
        while k < len(cs_l) and cs_l[k] < e:
            if cs_l[k] > cur:
                ns.append(cur)
                ne.append(cs_l[k])
                nl.append(lab)
            cur = max(cur, ce_l[k])
            k += 1
        if cur < e:
            ns.append(cur)
            ne.append(e)
            nl.append(lab)
    all_s = np.concatenate([cs, np.asarray(ns, np.int64)])
    order = np.argsort(all_s, kind="stable")
    return (all_s[order], np.concatenate([ce, np.asarray(ne, np.int64)])[order],
            np.concatenate([cl, np.asarray(nl, np.int64)])[order],
            np.concatenate([cg, np.zeros(len(ns), dtype=bool)])[order])  # fmt: skip


def _gpu_lane(idx: RankIndex, clock: ModuleClock) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compute kernels of every stream as one lane: each kernel keeps the time no earlier kernel
    already covers, labelled by the module its launch ran in."""
    at = np.flatnonzero(idx.is_compute_kernel)
    start, end = idx.table.start[at], idx.table.end[at]
    corr = idx.events["correlation"].to_numpy(dtype=np.int64, na_value=-1)[at]
    launches = idx.launched(at)
    flows = idx.flowed(at) if len(launches) < len(at) else {}
    lts = np.full(len(at), -1, dtype=np.int64)
    ltid = np.full(len(at), -1, dtype=np.int64)
    for i, (c, s, t) in enumerate(zip(corr.tolist(), start.tolist(), idx.table.tid[at].tolist())):
        hit = launches.get(c) or flows.get((s, t))
        if hit is not None:
            lts[i], ltid[i] = hit
    labels = np.where(lts >= 0, clock.at(lts, ltid), -1)
    order = np.argsort(start, kind="stable")
    start, end, labels = start[order], end[order], labels[order]
    reach = np.maximum.accumulate(end)
    clipped = np.maximum(start, np.concatenate(([start[0]], reach[:-1])) if len(start) else start)
    keep = end > clipped
    return clipped[keep], end[keep], labels[keep]


def _in_flight(collectives: pd.DataFrame | None) -> list[tuple[float, float]]:
    """When the rank's collectives were in flight, from issue to the end of their transfer (ns,
    merged)."""
    from sptrace.detect.timing import merge_intervals

    if collectives is None or collectives.empty:
        return []
    start = collectives["start_us"].to_numpy(dtype=float)
    moved = (collectives["transfer_start_us"] + collectives["transfer_dur_us"]).to_numpy(dtype=float)
    end = np.fmax(start + collectives["dur_us"].to_numpy(dtype=float), moved)
    return merge_intervals(start * 1e3, end * 1e3)


def _thread_work(
    cpu: pd.DataFrame, tid: int, clock: ModuleClock, waits: list[tuple[float, float]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One thread's work: its CPU ops and annotations (not the step's own ranges), less its
    communication ops; cut where the innermost module changes and labelled. A module range, and
    an op that issues a collective inside it (an autograd Function around a gather), is work
    only where no collective was in flight (``waits``): the thread may be blocked in it."""
    from sptrace.detect.timing import merge_intervals, subtract

    s = cpu["ts_ns"].to_numpy(dtype=np.int64, na_value=0)
    e = s + cpu["dur_ns"].to_numpy(dtype=np.int64, na_value=0)
    comm = has_prefix(cpu["name"], NOT_WORK)
    work = ~comm & ~has_prefix(cpu["name"], _NOT_THREAD_WORK)
    issued = np.sort(s[comm])
    first = np.searchsorted(issued, s, side="left")  # the first collective issued at or after the op
    holds = (first < len(issued)) & (issued[np.minimum(first, len(issued) - 1)] < e) if len(issued) else False
    piece_s, piece_e, _ = clock.pieces.get(tid, (np.empty(0, np.int64),) * 3)
    outer = work & holds
    work = work & ~holds
    # in a module's Python between ops, or in an op around a collective: work while none is in flight
    running = subtract(merge_intervals(np.concatenate([piece_s, s[outer]]), np.concatenate([piece_e, e[outer]])),
                       waits)  # fmt: skip
    rs = np.array([a for a, _ in running], dtype=np.int64)
    re_ = np.array([b for _, b in running], dtype=np.int64)
    busy = subtract(merge_intervals(np.concatenate([s[work], rs]), np.concatenate([e[work], re_])),
                    merge_intervals(s[comm], e[comm]))  # fmt: skip
    if not busy:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)
    bs = np.array([a for a, _ in busy], dtype=np.int64)
    be = np.array([b for _, b in busy], dtype=np.int64)
    # cut the busy stretches where a module piece starts or ends inside them
    cuts = np.unique(np.concatenate([bs, be, piece_s, piece_e]))
    lo, hi = cuts[:-1], cuts[1:]
    i = np.searchsorted(bs, lo, side="right") - 1
    inside = (i >= 0) & (hi <= be[np.maximum(i, 0)])
    lo, hi = lo[inside], hi[inside]
    return lo, hi, clock.at(lo, np.full(len(lo), tid, dtype=np.int64))


def _close_gaps(starts, ends, labels, lanes, gap: float) -> tuple[np.ndarray, ...]:
    """Consecutive stretches of one label and lane less than ``gap`` apart, joined."""
    same = (labels[1:] == labels[:-1]) & (lanes[1:] == lanes[:-1])
    join = np.concatenate(([False], same & (starts[1:] - ends[:-1] <= gap)))
    first = np.flatnonzero(~join)
    return starts[first], np.maximum.reduceat(ends, first), labels[first], lanes[first]


def _phases(idx: RankIndex, starts: np.ndarray, phases: list[str]) -> list[str]:
    """Each stretch's phase: the sptrace.phase marker around its start, else its range's
    (backward node, optimizer), else forward before the step's first backward node and backward
    after."""
    marks = idx.phase_markers
    out = list(phases)
    if len(marks):
        order = np.argsort(marks.start, kind="stable")
        ms, me = marks.start[order], marks.end[order]
        names = [marks.name(int(j))[len(markers.PHASE) :] for j in order]
        i = np.searchsorted(ms, starts, side="right") - 1
        for k, j in enumerate(i.tolist()):
            if j >= 0 and starts[k] < me[j]:
                out[k] = names[j]
    first = _first_backward(idx, starts)
    for k, p in enumerate(out):
        if p == "forward" or not p:
            out[k] = "backward" if starts[k] >= first[k] else "forward"
    return out


def _first_backward(idx: RankIndex, starts: np.ndarray) -> np.ndarray:
    """For each time, when the first backward node of its ProfilerStep ran (the trace's only
    step when it marks none); +inf where that step has none."""
    out = np.full(len(starts), np.inf)
    steps = idx.steps
    if not len(steps):
        if 0 in idx.first_backward:
            out[:] = idx.first_backward[0]
        return out
    order = np.argsort(steps.start, kind="stable")
    i = np.searchsorted(steps.start[order], starts, side="right") - 1
    inside = (i >= 0) & (starts <= steps.end[order][np.maximum(i, 0)])
    for k in np.flatnonzero(inside).tolist():
        first = idx.first_backward.get(int(order[i[k]]))
        if first is not None:
            out[k] = first
    return out
