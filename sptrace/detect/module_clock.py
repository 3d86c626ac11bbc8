"""Which module ran at any time on any thread of one rank, as one clock: the module ranges
(sptrace's markers, else the Python stacks' ``nn.Module`` frames), autograd's backward nodes
(charged to the module of the forward op each differentiates, by its sequence number) and the
optimizer's ranges; where none covers a time, the thread's outermost CPU range. What the work lane
(sptrace.detect.work) and the modules' own time are labelled with."""

from __future__ import annotations

import numpy as np
import pandas as pd

from sptrace.detect.columns import notna_rows
from sptrace.detect.index import RankIndex
from sptrace.detect.intervals import Intervals
from sptrace.detect.kinds import AUTOGRAD_NODE
from sptrace.vocab import markers

OPTIMIZER = "optimizer"
"""The label of the optimizer's ranges (its module and its phase)."""


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


def module_clock(idx: RankIndex) -> ModuleClock:
    """The rank's module ranges (forward), backward nodes and optimizer ranges as one clock; its
    threads' outermost CPU ranges where none covers a time."""
    labels: list[tuple[str | None, str]] = []
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    tids: list[np.ndarray] = []

    def add(ranges: Intervals, names: list[str | None], phase: str) -> None:
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
    outer = _outer_clock(idx.cpu_ops, ~(idx.cpu_op_is_comm | idx.cpu_op_is_label))
    if not labels:
        empty = np.empty(0, np.int64)
        return ModuleClock(empty, empty, empty, [], fallback=outer)
    return ModuleClock(*_joined(starts, ends, tids), labels, fallback=outer)


def _outer_clock(cpu: pd.DataFrame, keep: np.ndarray) -> ModuleClock:
    """Each thread's outermost CPU ranges inside the step (annotations such as ``## forward ##``,
    or top-level ops) of ``cpu`` (the rank's CPU events: tid, name, ts_ns, dur_ns), of those
    ``keep`` marks (neither communication nor the step's own ranges): what names work that no
    module range covers (a trace without python stacks or sptrace's markers)."""
    empty = np.empty(0, np.int64)
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


def _joined(
    starts: list[np.ndarray], ends: list[np.ndarray], tids: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.concatenate(starts), np.concatenate(ends), np.concatenate(tids)


def _backward_modules(idx: RankIndex, nodes: Intervals, forward: ModuleClock | None) -> list[str | None]:
    """Each backward node's module: the forward op of its sequence number, looked up on the
    forward clock; a node that carries no number is asked of RankIndex.module_of (its inner ops')."""
    seqs = nodes.column("seq_num")
    known = notna_rows(seqs)
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
