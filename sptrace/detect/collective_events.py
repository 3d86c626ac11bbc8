"""The events one collective of a rank is made of: its anchor (a CPU op, a record, an annotation,
a kernel or a gloo worker annotation), what is nested in it, and what carried it out.

Transfer time: the NCCL kernel(s) the op launched (linked by correlation through
cudaLaunchKernel*/cuLaunchKernel*/cudaGraphLaunch, by ``ac2g`` flows, or by External id), or the
gloo worker annotation(s) that carried it out. ``attach_kernels`` and ``attach_gloo`` link them;
what no collective claims becomes one of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sptrace.detect import forms
from sptrace.detect.args import load_list, present
from sptrace.detect.index import RankIndex
from sptrace.detect.intervals import EventRow
from sptrace.vocab import collective_kinds


@dataclass
class CollectiveEvents:
    """One collective being assembled: its op, kind, CPU span and thread, and its events."""

    op: str
    kind: str
    start: int
    end: int
    tid: int | None
    event: EventRow
    """The anchor's event row (op, record, kernel or annotation)."""
    rpc: EventRow | None = None
    note: EventRow | None = None
    inner: EventRow | None = None
    """A collective c10d op nested in the anchor (a functional op's c10d call)."""
    gloo: list[EventRow] = field(default_factory=list)
    kernels: list[EventRow] = field(default_factory=list)
    external_ids: set[int] = field(default_factory=set)
    anchor: str = "op"  # op | record | annotation | kernel | gloo


# ---- kernels -----------------------------------------------------------------------------------


def attach_kernels(idx: RankIndex, rows: list[CollectiveEvents]) -> list[CollectiveEvents]:
    """Give each collective the GPU kernels it launched; kernels no CPU collective launched
    (CUDA-graph replays, traces without CPU ops) become rows of their own."""
    if not len(idx.comm_kernels):
        return []
    # (only the launches and flows of these kernels: a GPU trace launches thousands of others)
    launch_at = idx.launched(idx.comm_kernels)  # correlation -> (launch ts, launch tid)
    flow_from = idx.flowed(idx.comm_kernels)  # (kernel ts, stream tid) -> (launch ts, tid)
    by_external: dict[int, CollectiveEvents] = {}
    for row in rows:
        for e in row.external_ids:
            by_external.setdefault(e, row)
    starts = np.array([r.start for r in rows], dtype=np.int64)
    ends = np.array([r.end for r in rows], dtype=np.int64)
    tids = np.array([-1 if r.tid is None else r.tid for r in rows], dtype=np.int64)
    extra: list[CollectiveEvents] = []
    for k in idx.rows(idx.comm_kernels):
        launch = None
        if present(k.correlation) and int(k.correlation) in launch_at:
            launch = launch_at[int(k.correlation)]
        else:
            launch = flow_from.get((int(k.ts_ns), int(k.tid) if present(k.tid) else -1))
        owner = None
        if launch is not None and len(rows):
            ts, tid = launch
            inside = np.flatnonzero((starts <= ts) & (ts <= ends) & ((tids == tid) | (tid == -1)))
            if len(inside):
                owner = rows[int(inside[np.argmax(starts[inside])])]
        if owner is None and present(k.external_id):
            owner = by_external.get(int(k.external_id))
        if owner is not None:
            owner.kernels.append(k)
            continue
        start = int(k.ts_ns)
        end = start + (int(k.dur_ns) if present(k.dur_ns) else 0)
        kind = collective_kinds.kernel_kind(str(k.name))
        named = collective_kinds.by_record_name().get(str(k.coll_name)) if present(k.coll_name) else None
        if named:
            kind = named  # RCCL's ncclDevKernel_Generic: the args tell
        row = CollectiveEvents(str(k.name)[:80], kind, launch[0] if launch else start, launch[0] if launch else end,
                               launch[1] if launch else None, event=k, anchor="kernel")  # fmt: skip
        row.kernels.append(k)
        extra.append(row)
    return extra


# ---- gloo --------------------------------------------------------------------------------------


def attach_gloo(idx: RankIndex, rows: list[CollectiveEvents]) -> list[CollectiveEvents]:
    """Give each collective the gloo worker annotation(s) that carried it out.

    gloo runs a process group's work in the order it was issued, on worker threads (send/recv on
    the calling thread). Annotations are matched first-in, first-out to the collectives of a kind
    they can carry out that were issued before they started, skipping any whose input shapes
    disagree. A list reduce-scatter runs as one all-reduce per output chunk: those extra
    all-reduces join it. Annotations nothing claims (a trace that starts mid-step) become rows."""
    if not len(idx.gloo):
        return []
    extra: list[CollectiveEvents] = []
    pending = [r for r in rows if r.anchor in ("op", "record", "annotation") and not r.kernels]
    for g in idx.gloo:
        kinds = collective_kinds.by_gloo_annotation()[str(g.name)]
        ts = int(g.ts_ns)
        dims = load_list(g.input_dims)
        fits = [r for r in _issued_before(pending, ts) if r.kind in kinds and (not dims or _dims_agree(r, dims))]
        chosen = next((r for r in fits if not r.gloo), None)
        if chosen is None:
            chosen = next((r for r in fits if _takes_more_gloo(r, dims)), None)
        if chosen is None:
            end = ts + (int(g.dur_ns) if present(g.dur_ns) else 0)
            tid = int(g.tid) if present(g.tid) else None
            row = CollectiveEvents(str(g.name), kinds[0], ts, end, tid, event=g, anchor="gloo")
            row.gloo.append(g)
            extra.append(row)
            continue
        chosen.gloo.append(g)
        if not _takes_more_gloo(chosen, dims):
            pending.remove(chosen)
    return extra


def _issued_before(rows: list[CollectiveEvents], ts: int) -> list[CollectiveEvents]:
    out = []
    for row in rows:  # in issue order
        if row.start > ts:
            break
        out.append(row)
    return out


def _takes_more_gloo(row: CollectiveEvents, dims: list) -> bool:
    """A list reduce-scatter (c10d::reduce_scatter_) is carried out by one all-reduce per rank."""
    return row.op == "c10d::reduce_scatter_" and bool(dims)


def _dims_agree(row: CollectiveEvents, dims: list) -> bool:
    """Do a gloo annotation's input shapes agree with what the collective sent (when known)?"""
    if row.op == "c10d::reduce_scatter_":  # each annotation all-reduces one output-sized chunk
        out = forms.output_shapes(row.op, row.event)
        return out is None or _flat_shapes(dims) == _flat_shapes(out)
    shapes = forms.input_shapes(row.op, row.event)
    if shapes is None:
        return True
    if row.kind in ("all_reduce", "reduce_scatter", "broadcast", "reduce", "send", "recv", "all_gather", "gather"):
        return _flat_shapes(dims) == _flat_shapes(shapes)
    return True


def _flat_shapes(shapes: list) -> list:
    return [tuple(s) for s in shapes if isinstance(s, list)]


def transfer_span(row: CollectiveEvents) -> tuple[int, int] | None:
    """When the collective's data moved: from its first kernel or gloo annotation's start to the
    last one's end (ns); None when nothing that carried it out is linked."""
    parts = row.kernels or row.gloo
    if not parts:
        return None
    starts = [int(p.ts_ns) for p in parts]
    ends = [int(p.ts_ns) + (int(p.dur_ns) if present(p.dur_ns) else 0) for p in parts]
    return min(starts), max(ends)
