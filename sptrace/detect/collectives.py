"""Find every collective of every rank: kind, process group, bytes, issue and transfer time,
phase and layer. Built for traces sptrace did not produce.

One collective is one row. Its anchor is the outermost collective CPU op (a c10d op, a functional
``_c10d_functional::`` op, ``symm_mem::``), else a ``record_param_comms`` / ``nccl:*`` record
without one, else a GPU kernel or a gloo worker annotation that no CPU op claims. What is nested
in the anchor (record_param_comms, nccl:* annotation, an inner c10d op) is read for its sizes.

This module finds the anchors and assembles the table; sptrace.detect.collective_events links
the kernels and gloo annotations that carried each collective out (its transfer time), and
sptrace.detect.collective_record reads each row's values off those events, each from the best
source the trace has. Issue time is the CPU op's own span.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sptrace.detect import forms
from sptrace.detect.args import present
from sptrace.detect.collective_events import CollectiveEvents, attach_gloo, attach_kernels
from sptrace.detect.collective_record import read_record
from sptrace.detect.groups import GroupTable
from sptrace.detect.index import RankIndex
from sptrace.detect.intervals import EventRow, Intervals
from sptrace.load.trace import RankTrace
from sptrace.vocab import collective_kinds

COLUMNS = [
    "rank", "kind", "op", "group", "group_size", "group_ranks", "peer", "dtype", "in_elems", "out_elems",
    "in_bytes", "out_bytes", "wire_bytes", "start_us", "dur_us", "transfer_start_us", "transfer_dur_us", "phase",
    "step", "layer", "module", "role", "seq", "source", "unknown", "tid",
]  # fmt: skip
"""start_us / dur_us: the CPU issue span; transfer_*: when the data moved (NCCL kernel, gloo worker)."""
RANK_COLUMNS = [*COLUMNS, "peer_candidates"]
"""A rank's table, before the reduce (resolve_peers) settles the peers only other ranks can name."""


def detect_collectives(trace: RankTrace, index: RankIndex | None = None, *, for_reduce: bool = False) -> pd.DataFrame:
    """One row per collective this rank issued (COLUMNS), in issue order. ``index``: the rank's
    RankIndex when the caller has built it already. ``for_reduce``: keep the ``peer_candidates``
    column that ``resolve_peers`` settles once every rank's table is there (RANK_COLUMNS)."""
    idx = index or RankIndex(trace)
    is_anchor = idx.by_name.one_of(forms.all_forms()) | idx.by_name.prefix("symm_mem::")
    anchors = Intervals.of(idx.table, idx.is_cpu & is_anchor)
    rows: list[CollectiveEvents] = []
    claimed_rpc: set[int] = set()
    claimed_nccl: set[int] = set()
    nested: set[int] = set()
    for i in range(len(anchors)):
        outer = anchors.enclosing(int(anchors.start[i]), int(anchors.end[i]), int(anchors.tid[i]))
        if len(outer) > 1:
            nested.add(i)  # a c10d op inside a functional one: read for sizes, not a row of its own
    for i in range(len(anchors)):
        if i in nested:
            continue
        op = anchors.row(i)
        start, end, tid = int(anchors.start[i]), int(anchors.end[i]), int(anchors.tid[i])
        name = str(op["name"])
        form = forms.form_of(name)
        kind = form.kind if form else next(k for p, k in collective_kinds.symm_mem_patterns() if p.search(name))
        row = CollectiveEvents(name, kind, start, end, tid, event=op)
        inner = [j for j in anchors.inside(start, end, tid) if j in nested]
        if inner:
            row.inner = anchors.row(int(inner[0]))
        rpcs = idx.rpc.inside(start, end, tid)
        notes = idx.nccl_annotations.inside(start, end, tid)
        claimed_rpc.update(int(j) for j in rpcs)
        claimed_nccl.update(int(j) for j in notes)
        row.rpc = _first_collective_record(idx.rpc, rpcs)
        row.note = idx.nccl_annotations.row(int(notes[0])) if len(notes) else None
        rows.append(row)
    # record_param_comms / nccl annotations with no c10d op around them (older NCCL paths)
    for j in range(len(idx.rpc)):
        if j in claimed_rpc:
            continue
        rpc = idx.rpc.row(j)
        kind = collective_kinds.by_record_name().get(str(rpc["coll_name"])) if present(rpc["coll_name"]) else None
        start, end, tid = int(idx.rpc.start[j]), int(idx.rpc.end[j]), int(idx.rpc.tid[j])
        notes = idx.nccl_annotations.inside(start, end, tid)
        claimed_nccl.update(int(k) for k in notes)
        note = idx.nccl_annotations.row(int(notes[0])) if len(notes) else None
        if kind is None and note is not None:
            kind = collective_kinds.by_nccl_annotation()[str(note["name"])]
        if kind is None:
            continue  # work.wait() and unlabelled bookkeeping: not a collective
        rows.append(CollectiveEvents("record_param_comms", kind, start, end, tid, event=rpc, rpc=rpc, note=note,
                                     anchor="record"))  # fmt: skip
    for j in range(len(idx.nccl_annotations)):
        if j in claimed_nccl:
            continue
        note = idx.nccl_annotations.row(j)
        start, end = int(idx.nccl_annotations.start[j]), int(idx.nccl_annotations.end[j])
        tid = int(idx.nccl_annotations.tid[j])
        kind = collective_kinds.by_nccl_annotation()[str(note["name"])]
        rows.append(CollectiveEvents(str(note["name"]), kind, start, end, tid, event=note, note=note,
                                     anchor="annotation"))  # fmt: skip
    rows.sort(key=lambda r: r.start)
    for row in rows:
        for ev in (row.event, row.rpc, row.note, row.inner):
            if ev is not None and present(ev.get("external_id")):
                row.external_ids.add(int(ev["external_id"]))
    rows += attach_kernels(idx, rows)
    rows += attach_gloo(idx, rows)
    rows.sort(key=lambda r: r.start)
    groups = GroupTable(trace)
    records = [read_record(idx, trace.rank, groups, row) for row in rows]
    # column by column: pandas reads a list of records through a 2-d object array, 1.6x the time
    frame = pd.DataFrame({c: [r[c] for r in records] for c in RANK_COLUMNS}) if records else (
        pd.DataFrame(records, columns=RANK_COLUMNS))  # fmt: skip
    return frame if for_reduce else frame.drop(columns=["peer_candidates"])


def _first_collective_record(rpc: Intervals, inside: np.ndarray) -> EventRow | None:
    """The record_param_comms of the collective itself (not a nested wait) among those inside."""
    if not len(inside):
        return None
    frames = [rpc.row(int(j)) for j in inside]
    for f in frames:
        if not present(f.get("coll_name")) or collective_kinds.by_record_name().get(str(f["coll_name"])) is not None:
            return f
    return frames[0]
