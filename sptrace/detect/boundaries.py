"""Every forward -> backward boundary in a rank's trace, each with the forward it consumes.

A trace may hold several steps (a profiler schedule with ``active`` > 1) and several
micro-batches per step (gradient accumulation f0 b0 f1 b1, or a pipeline's 1F1B order f0 f1 b0
f2 b1 ...). What a forward keeps for backward is judged across ITS boundary: the start of the
backward that consumes it. Backwards consume forwards in order (first in, first out), which holds
for accumulation and for every pipeline schedule that runs micro-batches in order.

Where the forwards and backwards come from, in order of trust:
  1. sptrace.phase markers: each ``backward`` range consumes the earliest unconsumed ``forward``;
  2. autograd itself: backward nodes (``autograd::engine::evaluate_function: ...``) grouped into
     one backward per run of nodes that no forward op interrupts; its forward is what ran since
     the latest of: the previous backward's end, the previous forward's last op linked to its
     backward, the step's start, the trace's start, taken no later than its own first forward op
     whose ``Sequence number`` its nodes carry (autograd's own forward -> backward link).
A window of a forward ends where the next forward starts, or at its boundary: in 1F1B the next
micro-batch's forward and the previous backward run before this boundary, and what they allocate
is theirs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sptrace.detect.index import RankIndex
from sptrace.vocab import markers


@dataclass(frozen=True, slots=True)
class Boundary:
    """One forward and the backward that consumes it."""

    forward_ns: int
    """Where the forward starts."""
    window_end_ns: int
    """Where what this forward allocates stops being its own: its boundary, or the next
    forward's start if that comes first."""
    backward_ns: int
    """The boundary: where the backward starts."""
    backward_end_ns: int
    step: int | None
    """The ProfilerStep#N the backward runs in (None without step markers)."""
    micro_batch: int
    """0, 1, ... in the order of the step's backwards."""

    def label(self, many_steps: bool, many_micro: bool) -> str:
        parts = []
        if many_steps and self.step is not None:
            parts.append(f"step {self.step}")
        if many_micro:
            parts.append(f"micro-batch {self.micro_batch}")
        return ", ".join(parts)


def find_boundaries(idx: RankIndex, trace_start_ns: int) -> list[Boundary]:
    """The rank's boundaries in time order (empty when its window has no backward)."""
    pairs, forwards = _from_markers(idx)
    if not pairs:
        pairs = _from_autograd(idx, trace_start_ns)
        forwards = [f for f, _, _ in pairs]
    out: list[Boundary] = []
    per_step: dict[int | None, int] = {}
    for f_start, b_start, b_end in pairs:
        later = [f for f in forwards if f_start < f < b_start]  # the next forward (1F1B) starts first
        step = idx.step_of(b_start)
        micro = per_step.get(step, 0)
        per_step[step] = micro + 1
        out.append(Boundary(f_start, min([b_start, *later]), b_start, b_end, step, micro))
    return out


def _from_markers(idx: RankIndex) -> tuple[list[tuple[int, int, int]], list[int]]:
    marks = idx.phase_markers
    names = [marks.name(i) for i in range(len(marks))]
    forwards = sorted(int(marks.start[i]) for i, n in enumerate(names) if n == markers.phase_name("forward"))
    backwards = sorted(
        (int(marks.start[i]), int(marks.end[i])) for i, n in enumerate(names) if n == markers.phase_name("backward")
    )
    pairs = []
    queue = list(forwards)
    for b_start, b_end in backwards:
        waiting = [f for f in queue if f < b_start]
        if not waiting:
            continue  # a backward with no forward in the window: its forward ran before profiling
        f = waiting[0]
        queue.remove(f)
        pairs.append((f, b_start, b_end))
    return pairs, forwards


def _from_autograd(idx: RankIndex, trace_start_ns: int) -> list[tuple[int, int, int]]:
    nodes = idx.backward_nodes
    if not len(nodes):
        return []
    order = np.argsort(nodes.start, kind="stable")
    starts, ends = nodes.start[order], nodes.end[order]
    seqs = nodes.column("seq_num").to_numpy(dtype=float, na_value=np.nan)[order]
    fwd = idx.forward_by_seq
    fwd_ts = fwd["ts_ns"].to_numpy(dtype=np.int64)
    fwd_end = fwd_ts + fwd["dur_ns"].fillna(0).to_numpy(dtype=np.int64)
    fwd_seq = fwd["seq_num"].to_numpy(dtype=np.int64)
    sorted_fwd = np.sort(fwd_ts)
    # one backward = a run of nodes with no forward op starting between them
    segments: list[list[int]] = [[0]]
    reach = int(ends[0])
    for i in range(1, len(starts)):
        between = np.searchsorted(sorted_fwd, starts[i], "left") - np.searchsorted(sorted_fwd, reach, "right")
        if between > 0:
            segments.append([i])
        else:
            segments[-1].append(i)
        reach = max(reach, int(ends[i]))
    segments = [part for seg in segments for part in _split_grouped(seg, seqs, dict(zip(fwd_seq, fwd_ts)))]
    pairs = []
    previous_end = previous_linked_end = None
    for seg in segments:
        b_start, b_end = int(starts[seg[0]]), int(max(ends[seg]))
        linked = np.isin(fwd_seq, seqs[seg][~np.isnan(seqs[seg])].astype(np.int64)) & (fwd_end <= b_start)
        first_linked = int(fwd_ts[linked].min()) if linked.any() else b_start
        # the forward starts after whatever came before it: the previous backward, the previous
        # forward's linked ops (1F1B), the step's start; the ops that create no autograd node
        # before its first linked one (a norm's first multiply) are its own
        since = [x for x in (previous_end, previous_linked_end, _step_start(idx, b_start), trace_start_ns)
                 if x is not None and x <= first_linked]  # fmt: skip
        pairs.append((max(since) if since else first_linked, b_start, b_end))
        previous_end = b_end
        previous_linked_end = int(fwd_end[linked].max()) if linked.any() else previous_linked_end
    return pairs


def _split_grouped(seg: list[int], seqs: np.ndarray, forward_at: dict[int, int]) -> list[list[int]]:
    """Backwards that run back to back (gradient accumulation as f0 f1 b0 b1) form one run of
    nodes. A backward visits its forward's ops from the last to the first, so the forward op
    each node links to (by Sequence number) only goes back in time; a node linked to a forward op
    later than any its run has visited starts the next backward."""
    parts: list[list[int]] = [[seg[0]]]
    top = _linked(seg[0], seqs, forward_at)
    for i in seg[1:]:
        t = _linked(i, seqs, forward_at)
        if t is not None and top is not None and t > top:
            parts.append([i])
            top = t
            continue
        parts[-1].append(i)
        top = t if top is None else top
    return parts


def _linked(i: int, seqs: np.ndarray, forward_at: dict[int, int]) -> int | None:
    seq = seqs[i]
    return None if np.isnan(seq) else forward_at.get(int(seq))


def _step_start(idx: RankIndex, ts: int) -> int | None:
    if not len(idx.steps):
        return None
    inside = idx.steps.enclosing(ts, ts)
    return int(idx.steps.start[int(inside[-1])]) if len(inside) else None
