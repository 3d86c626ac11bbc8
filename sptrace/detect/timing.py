"""Where each rank's step went: step time, communication time and exposed communication.

Communication time is transfer time, the union of the intervals in which data moved (a
collective's NCCL kernels, or its gloo worker annotations), never CPU issue time: an NCCL call
returns in microseconds while its kernel runs for milliseconds, and a gloo call's worker moves the
data on another thread. Collectives with no transfer record count with their CPU span, and
the count of those is reported.

Exposed communication (GPU traces): the part of the transfer union that no compute kernel
overlaps, on the same device. A CPU (gloo) trace has no GPU streams, so it has no exposed figure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sptrace.detect.columns import empty_frame, has_prefix, take_columns
from sptrace.detect.index import RankIndex
from sptrace.detect.kinds import COMM_CALLS
from sptrace.load.trace import RankTrace
from sptrace.vocab import markers


@dataclass(frozen=True, slots=True)
class RankTiming:
    rank: int
    step_ms: float | None
    """The profiled step; ``step_source`` says what measured it (step_window)."""
    comm_ms: float
    """Union of transfer intervals."""
    exposed_ms: float | None
    """Transfer time not overlapped by compute kernels (None without GPU kernels)."""
    issue_only: int
    """Collectives counted with their CPU span: no kernel or worker annotation was linked."""
    step_source: str = "the trace's span"
    step_start_us: float | None = None
    """Where the step starts (the zero of "ms from the step start"), on this rank's clock."""
    steps: tuple[tuple[str, float, float], ...] = ()
    """Every ``ProfilerStep#N`` the trace holds: (name, start_us, end_us) on this rank's clock, in
    time order (a profiler schedule with several active steps records each)."""

    @property
    def compute_ms(self) -> float | None:
        return None if self.step_ms is None else max(self.step_ms - self.comm_ms, 0.0)

    def to_dict(self) -> dict[str, float | int | None]:
        return {
            "rank": self.rank, "step_ms": self.step_ms, "comm_ms": self.comm_ms, "exposed_ms": self.exposed_ms,
            "compute_ms": self.compute_ms, "issue_only": self.issue_only, "step_source": self.step_source,
            "step_start_us": self.step_start_us,
        }  # fmt: skip


def step_sources(timing: Iterable[RankTiming]) -> str | None:
    """What measured the ranks' steps (step_window), once each: "ProfilerStep#", or several
    joined by " / " when ranks differ; None when no rank has a step."""
    return " / ".join(sorted({t.step_source for t in timing if t.step_ms is not None})) or None


def step_starts_us(timing: Iterable[RankTiming]) -> dict[int, float]:
    """Each rank's step start (the zero of "ms from the step start"), where it has one."""
    return {t.rank: t.step_start_us for t in timing if t.step_start_us is not None}


def union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length covered by intervals [start, end) (any order, overlaps counted once)."""
    merged = merge_intervals(starts, ends)
    return float(sum(e - s for s, e in merged))


def merge_intervals(starts: np.ndarray, ends: np.ndarray) -> list[tuple[float, float]]:
    if not len(starts):
        return []
    order = np.argsort(starts, kind="stable")
    s, e = np.asarray(starts, dtype=float)[order], np.asarray(ends, dtype=float)[order]
    reach = np.maximum.accumulate(e)  # the latest end so far: a range starting after it begins anew
    first = np.concatenate(([True], s[1:] > reach[:-1]))
    last = np.concatenate((first[1:], [True]))
    return list(zip(s[first].tolist(), reach[last].tolist()))


def subtract(keep: list[tuple[float, float]], remove: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of the union ``keep`` that the union ``remove`` does not cover (both merged, sorted)."""
    out: list[tuple[float, float]] = []
    j = 0
    for s, e in keep:
        cur = s
        while j < len(remove) and remove[j][1] <= cur:
            j += 1
        k = j
        while k < len(remove) and remove[k][0] < e:
            rs, re_ = remove[k]
            if rs > cur:
                out.append((cur, rs))
            cur = max(cur, re_)
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def subtract_length(keep: list[tuple[float, float]], remove: list[tuple[float, float]]) -> float:
    """Length of the union ``keep`` not covered by the union ``remove`` (both merged, sorted)."""
    return float(sum(e - s for s, e in subtract(keep, remove)))


def step_window(trace: RankTrace, idx: RankIndex) -> tuple[tuple[int, int] | None, str]:
    """The profiled step's [start, end] in ns and what measured it, best first:
    * the profiler's ``ProfilerStep#N`` (the longest, when the window holds several);
    * sptrace's phase markers (forward, backward, optimizer), first start to last end;
    * the training work itself: the first forward op autograd numbered (``Sequence number``)
      to the end of the last backward node or optimizer step, which leaves out what a trace
      without step markers holds around the step (data loading, logging, a barrier);
    * else the trace's span, first to last event."""
    steps = idx.steps
    if len(steps):
        i = int(np.argmax(steps.end - steps.start))
        return (int(steps.start[i]), int(steps.end[i])), "ProfilerStep#"
    phases = idx.phase_markers
    if len(phases):
        return (int(phases.start.min()), int(phases.end.max())), "sptrace.phase markers"
    fwd = idx.forward_by_seq
    ends = [r.end for r in (idx.backward_nodes, idx.optimizer) if len(r)]
    if len(fwd) and len(idx.backward_nodes):
        start = int(fwd["ts_ns"].to_numpy(dtype=np.int64, na_value=0).min())
        end = int(max(e.max() for e in ends))
        if end > start:
            return (start, end), "first autograd op to last backward/optimizer op"
    span = trace.time_span_ns()
    return (None if span is None else (int(span[0]), int(span[1]))), "the trace's span"


def detect_timing(trace: RankTrace, collectives: pd.DataFrame, index: RankIndex | None = None) -> RankTiming:
    """``collectives``: this rank's rows of detect_collectives."""
    idx = index or RankIndex(trace)
    window, source = step_window(trace, idx)
    step_ms = None if window is None else (window[1] - window[0]) / 1e6
    mine = collectives
    if "rank" in collectives:
        ours = (collectives["rank"] == trace.rank).to_numpy()
        mine = collectives if ours.all() else collectives[ours]  # (the map's table: every row is ours)
    if window is not None and source == "ProfilerStep#" and len(idx.steps) > 1 and len(mine):
        # several profiled steps: the communication of the step measured (the longest), not of all
        begin, end = window[0] / 1e3, window[1] / 1e3
        start = mine["start_us"].astype(float)
        mine = mine[(start >= begin) & (start <= end)]
    has_transfer = mine["transfer_start_us"].notna() if len(mine) else pd.Series(dtype=bool)
    starts = np.where(has_transfer, mine["transfer_start_us"].astype(float), mine["start_us"].astype(float))
    durs = np.where(has_transfer, mine["transfer_dur_us"].astype(float), mine["dur_us"].astype(float))
    comm = merge_intervals(starts, starts + durs) if len(mine) else []
    comm_ms = sum(e - s for s, e in comm) / 1e3
    exposed = None
    if idx.is_compute_kernel.any() or len(idx.comm_kernels):
        exposed = subtract_length(comm, merge_intervals(*idx.compute_kernels)) / 1e3
    return RankTiming(
        rank=int(trace.rank) if trace.rank is not None else 0, step_ms=step_ms, comm_ms=comm_ms,
        exposed_ms=exposed, issue_only=int((~has_transfer).sum()) if len(mine) else 0, step_source=source,
        step_start_us=None if window is None else window[0] / 1e3, steps=profiler_steps(idx),
    )  # fmt: skip


def profiler_steps(idx: RankIndex) -> tuple[tuple[str, float, float], ...]:
    """The rank's ``ProfilerStep#N`` ranges: (name, start_us, end_us), in time order."""
    steps = idx.steps
    order = np.argsort(steps.start, kind="stable")
    return tuple((steps.name(int(i)), float(steps.start[i]) / 1e3, float(steps.end[i]) / 1e3) for i in order)


def detect_compute(trace: RankTrace, index: RankIndex | None = None, max_segments: int = 2000) -> pd.DataFrame:
    """When the rank computed: its GPU compute kernels, or on a CPU trace the aten ops of its
    busiest thread (communication left out), merged so that at most ``max_segments``
    remain (gaps shorter than the step's 1/``max_segments`` are closed). Columns: rank, start_us,
    dur_us."""
    idx = index or RankIndex(trace)
    if idx.is_compute_kernel.any():
        merged = merge_intervals(*idx.compute_kernels)
    else:
        ev = idx.events
        cpu = take_columns(ev, idx.is_cpu & idx.by_cat.one_of(["cpu_op"]), ["tid", "name", "ts_ns", "dur_ns"])
        if cpu.empty:
            return empty_frame(["rank", "start_us", "dur_us"])
        busiest = cpu["tid"].value_counts().index[0]
        cpu = cpu[cpu["tid"] == busiest]
        comm = has_prefix(cpu["name"], _NOT_COMPUTE)

        def spans(frame: pd.DataFrame) -> list[tuple[float, float]]:
            s = frame["ts_ns"].to_numpy(dtype=np.int64, na_value=0) / 1e3
            return merge_intervals(s, s + frame["dur_ns"].to_numpy(dtype=np.int64, na_value=0) / 1e3)

        # aten ops are the computation (a Python-level wait for a collective is inside no aten op);
        # an aten op around a collective computes only around it
        aten = has_prefix(cpu["name"], "aten::")
        merged = subtract(spans(cpu[aten & ~comm]), spans(cpu[comm]))
    if merged:
        span = merged[-1][1] - merged[0][0]
        gap = span / max_segments
        closed: list[list[float]] = []
        for s, e in merged:
            if closed and s - closed[-1][1] <= gap:
                closed[-1][1] = max(closed[-1][1], e)
            else:
                closed.append([s, e])
        merged = [(a, b) for a, b in closed]
    return pd.DataFrame({"rank": trace.rank, "start_us": [s for s, _ in merged], "dur_us": [e - s for s, e in merged]})


_NOT_COMPUTE = (*COMM_CALLS, "ProfilerStep", "sptrace.", "Optimizer.")
"""CPU ops that are not computation: communication, and the step's and sptrace's own ranges."""


MODULE_TIME_COLUMNS = ["rank", "module", "phase", "ms"]


def detect_module_times(trace: RankTrace, index: RankIndex | None = None) -> pd.DataFrame:
    """Each module's own time (its range less the ranges of the modules it called), forward and
    backward: forward from the module ranges sptrace's markers record, else the Python stacks'
    ``nn.Module`` frames (named as ``RankIndex.python_module`` names them); backward from
    autograd's nodes, each charged to the module of the forward op it differentiates (its
    sequence number, RankIndex.module_of). Columns: MODULE_TIME_COLUMNS (ms)."""
    idx = index or RankIndex(trace)
    rank = int(trace.rank) if trace.rank is not None else 0
    totals: dict[tuple[str, str], float] = {}
    ranges = idx.module_markers
    if len(ranges):
        names = [ranges.name(i)[len(markers.MODULE) :] for i in range(len(ranges))]
    else:  # the Python stacks' module frames, by the path python_module gives them
        frames = idx.python
        keep = [i for i in range(len(frames)) if frames.name(i).startswith("nn.Module: ")]
        ranges = frames.subset(keep)
        names = [idx.python_module(int(ranges.start[i]), int(ranges.end[i]), int(ranges.tid[i])) or "?"
                 for i in range(len(ranges))]  # fmt: skip
    for name, own in zip(names, _own_times(ranges.start, ranges.end, ranges.tid)):
        phase = "forward"  # a module range is its forward call (backward runs in autograd's nodes)
        totals[(name, phase)] = totals.get((name, phase), 0.0) + own
    nodes = idx.backward_nodes
    outer = _own_times(nodes.start, nodes.end, nodes.tid) if len(nodes) else []
    for i, own in enumerate(outer):
        module, _, _ = idx.module_of(int(nodes.start[i]), int(nodes.end[i]), int(nodes.tid[i]))
        key = (module or "(no module)", "backward")
        totals[key] = totals.get(key, 0.0) + own
    rows = [(rank, m, p, ns / 1e6) for (m, p), ns in totals.items()]
    return pd.DataFrame(rows, columns=MODULE_TIME_COLUMNS)


def _own_times(start: np.ndarray, end: np.ndarray, tid: np.ndarray) -> list[float]:
    """Each range's duration less its direct children's (ranges nested in it on its thread), in
    the ranges' order. Hand-written: one pass over the ranges sorted by thread, start and longest
    first, with a stack of the open ranges (pandas has no interval-nesting operation)."""
    own = (np.asarray(end) - np.asarray(start)).astype(float)
    order = np.lexsort((-(np.asarray(end) - np.asarray(start)), start, tid))
    stack: list[int] = []
    for i in order.tolist():
        while stack and (tid[stack[-1]] != tid[i] or end[stack[-1]] < end[i] or start[i] >= end[stack[-1]]):
            stack.pop()
        if stack:
            own[stack[-1]] -= end[i] - start[i]
        stack.append(i)
    return own.tolist()
