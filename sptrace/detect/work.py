"""Where one rank's work lane was busy, and in which module: what the cross-rank critical path
(sptrace.reduce.critical) walks back through between collectives.

The lane is the rank's GPU compute (every compute kernel of every stream, merged) and, where
the GPU idled, its busiest CPU threads' work (the GPU then waited for the host: its launches,
data loading); on a CPU trace, its busiest threads' work. A thread's work is its CPU ops and
annotations, module ranges and autograd's backward nodes, less the time it spent inside
communication ops (issuing or waiting on a collective is not work). A communication annotation
(``gloo:send``, ``nccl:all_reduce``) can span an async call from its issue to its wait: the ops
that ran inside it meanwhile (ring attention's blocks while K,V travel) are work; only the time
between them is waiting.

Each stretch of work is labelled with the innermost module running on the CPU where the work
came from: a kernel at the time and thread of its launch, a CPU stretch where it ran, as the
rank's module clock (sptrace.detect.module_clock) tells it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import pandas as pd

from sptrace.detect.columns import empty_frame, notna_rows
from sptrace.detect.index import RankIndex
from sptrace.detect.module_clock import ModuleClock, module_clock
from sptrace.load.frame import categorical_dtype
from sptrace.load.trace import RankTrace
from sptrace.vocab import markers

WORK_COLUMNS = ["rank", "start_us", "dur_us", "module", "phase", "lane"]
"""One stretch of a rank's work on its own clock: ``module`` (None where no module range covers
it), ``phase`` (forward, backward, optimizer, or what sptrace.phase markers name), ``lane`` (gpu
or cpu)."""


def detect_work(
    trace: RankTrace, index: RankIndex | None = None, collectives: pd.DataFrame | None = None,
    max_segments: int = 4000, threads: int = 4, clock: ModuleClock | None = None,
) -> pd.DataFrame:  # fmt: skip
    """The rank's work lane (module docstring), as labelled stretches (gaps shorter than the
    step's 1/``max_segments`` are closed within one label): the GPU's compute first, then the
    work of its ``threads`` busiest CPU threads where nothing before them covers the time.
    ``collectives``: the rank's (sptrace.detect.collectives): from a collective's issue to the end
    of its transfer, a thread that runs no op is waiting on it, even inside a module's range.
    ``clock``: the rank's module clock (sptrace.detect.module_clock), when the caller built it already."""
    idx = index or RankIndex(trace)
    waits = _in_flight(collectives)
    rank = int(trace.rank) if trace.rank is not None else 0
    clock = clock or module_clock(idx)
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
    ops = _CpuOps.of(idx)
    for tid in ops.busiest(threads if gpu else 1):
        ts, te, tl = _thread_work(ops.of_thread(tid), tid, clock, waits)
        cover = _fill(cover, ts, te, tl, blocked)
    starts, ends, labels, lanes = cover
    if not len(starts):
        return empty_frame(WORK_COLUMNS)
    s, e, lab, lane = _close_gaps(starts, ends, labels, lanes, (ends.max() - starts.min()) / max_segments)
    names = [clock.labels[x] if x >= 0 else (None, "") for x in lab]
    phases = phases_at(idx, s, [p for _, p in names])
    # names as categories: a rank's few hundred stretches repeat a few dozen names, and a run's
    # thousand ranks' lanes are all held until the reduce
    # (WORK_COLUMNS in order: a columns= would cost pandas a reindex)
    return pd.DataFrame({
        "rank": rank,
        "start_us": s / 1e3,
        "dur_us": (e - s) / 1e3,
        "module": _categories([m for m, _ in names]),
        "phase": _categories(phases),
        "lane": pd.Categorical.from_codes(lane.astype(np.int8), ["cpu", "gpu"]),
    })  # fmt: skip


def _categories(values: list[str | None]) -> pd.Categorical:
    """Names as a categorical (None: missing), categories in order of first appearance (as
    pandas' factorize orders them), their dtype shared with the other ranks'."""
    code: dict[str, int] = {}
    codes = np.fromiter(
        (-1 if v is None else code.setdefault(v, len(code)) for v in values), dtype=np.int32, count=len(values)
    )
    return pd.Categorical.from_codes(codes, dtype=categorical_dtype(tuple(code)), validate=False)


def _fill(cover: tuple[np.ndarray, ...], starts: np.ndarray, ends: np.ndarray, labels: np.ndarray,
          blocked: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, ...]:  # fmt: skip
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


@dataclass(frozen=True)
class _CpuOps:
    """A rank's CPU ops and annotations as arrays, each name tested once for the whole rank."""

    tid: np.ndarray
    has_tid: np.ndarray
    start: np.ndarray
    end: np.ndarray
    comm: np.ndarray
    """Communication: issuing or waiting on a collective (kinds.NOT_WORK)."""
    work: np.ndarray
    """Neither communication nor the step's own ranges (kinds.NOT_THREAD_WORK)."""
    mark: np.ndarray
    """Communication annotations (gloo:send, nccl:all_reduce), which may span an async call."""

    @classmethod
    def of(cls, idx: RankIndex) -> _CpuOps:
        """The rank's CPU ops (RankIndex.cpu_ops), tested on the index's own distinct names."""
        cpu, rows = idx.cpu_ops, idx.is_cpu
        start = cpu["ts_ns"].to_numpy(dtype=np.int64, na_value=0)
        comm = idx.cpu_op_is_comm
        annotation = idx.by_cat.one_of(["user_annotation"])[rows]
        tid = cpu["tid"]
        return cls(tid.to_numpy(dtype=np.int64, na_value=-1), notna_rows(tid), start,
                   start + cpu["dur_ns"].to_numpy(dtype=np.int64, na_value=0), comm,
                   ~comm & ~idx.cpu_op_is_label, comm & annotation)  # fmt: skip

    def busiest(self, n: int) -> list[int]:
        """The ``n`` threads with the most events (ties: the one seen first, as pandas'
        value_counts orders them)."""
        ids, first, counts = np.unique(self.tid[self.has_tid], return_index=True, return_counts=True)
        order = np.lexsort((first, -counts))
        return ids[order][:n].tolist()

    def of_thread(self, tid: int) -> _CpuOps:
        at = np.flatnonzero((self.tid == tid) & self.has_tid)
        return _CpuOps(*(getattr(self, f.name)[at] for f in fields(self)))


def _thread_work(
    ops: _CpuOps, tid: int, clock: ModuleClock, waits: list[tuple[float, float]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One thread's work: its CPU ops and annotations (not the step's own ranges), less its
    communication ops; cut where the innermost module changes and labelled. A module range, and
    an op that issues a collective inside it (an autograd Function around a gather), is work
    only where no collective was in flight (``waits``): the thread may be blocked in it."""
    from sptrace.detect.timing import merge_intervals, subtract

    s, e, comm, work = ops.start, ops.end, ops.comm, ops.work
    # a comm annotation (gloo:send, nccl:all_reduce) may span from an async call's issue to its
    # wait: the ops that ran inside it meanwhile (ring attention's blocks) are work
    marks = ops.mark
    issued = np.sort(s[comm])
    first = np.searchsorted(issued, s, side="left")  # the first collective issued at or after the op
    holds = (first < len(issued)) & (issued[np.minimum(first, len(issued) - 1)] < e) if len(issued) else False
    piece_s, piece_e, _ = clock.pieces.get(tid, (np.empty(0, np.int64),) * 3)
    outer = work & holds
    work = work & ~holds
    ops_s, ops_e = s[work], e[work]
    # in a module's Python between ops, or in an op around a collective: work while none is in flight
    running = subtract(merge_intervals(np.concatenate([piece_s, s[outer]]), np.concatenate([piece_e, e[outer]])),
                       waits)  # fmt: skip
    rs = np.array([a for a, _ in running], dtype=np.int64)
    re_ = np.array([b for _, b in running], dtype=np.int64)
    waiting = merge_intervals(s[comm & ~marks], e[comm & ~marks])
    waiting += subtract(merge_intervals(s[marks], e[marks]), merge_intervals(ops_s, ops_e))
    waiting = merge_intervals(np.array([a for a, _ in waiting]), np.array([b for _, b in waiting]))
    busy = subtract(merge_intervals(np.concatenate([ops_s, rs]), np.concatenate([ops_e, re_])), waiting)
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


def _close_gaps(
    starts: np.ndarray, ends: np.ndarray, labels: np.ndarray, lanes: np.ndarray, gap: float
) -> tuple[np.ndarray, ...]:
    """Consecutive stretches of one label and lane less than ``gap`` apart, joined."""
    same = (labels[1:] == labels[:-1]) & (lanes[1:] == lanes[:-1])
    join = np.concatenate(([False], same & (starts[1:] - ends[:-1] <= gap)))
    first = np.flatnonzero(~join)
    return starts[first], np.maximum.reduceat(ends, first), labels[first], lanes[first]


def phases_at(idx: RankIndex, starts: np.ndarray, phases: list[str]) -> list[str]:
    """Each stretch's phase: the sptrace.phase marker around its start, else its range's
    (backward node, optimizer), else backward in its iteration's backward (RankIndex.in_backward)
    and forward before."""
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
    backward = idx.in_backward(starts)
    for k, p in enumerate(out):
        if p == "forward" or not p:
            out[k] = "backward" if backward[k] else "forward"
    return out
