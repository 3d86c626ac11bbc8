"""Find every collective of every rank: kind, process group, bytes, issue and transfer time,
phase and layer. Built for traces sptrace did not produce.

One collective is one row. Its anchor is the outermost collective CPU op (a c10d op, a functional
``_c10d_functional::`` op, ``symm_mem::``), else a ``record_param_comms`` / ``nccl:*`` record
without one, else a GPU kernel or a gloo worker annotation that no CPU op claims. What is nested
in the anchor (record_param_comms, nccl:* annotation, an inner c10d op) is read for its sizes.

Sizes, element type and group, each from the best source the trace has, named in ``source``:
  record_param_comms args (NCCL: Collective name, msg nelems, dtype, Group size, group name, Seq),
  the op's own Input Dims / Input type / Concrete Inputs, read per op signature (sptrace.detect.forms),
  the matched gloo worker annotation (gloo: the element type of TensorList ops),
  the nccl:* annotation's Input Dims (older NCCL traces),
  the kernel's copied args, the process groups of ``distributedInfo``, and the out/in ratio of a
  gather or scatter. What cannot be known is null, and ``unknown`` says what and why.

Transfer time: the NCCL kernel(s) the op launched (linked by correlation through
cudaLaunchKernel*/cuLaunchKernel*/cudaGraphLaunch, by ``ac2g`` flows, or by External id), or the
gloo worker annotation(s) that carried it out. Issue time is the CPU op's own span.
Phase comes from sptrace.phase markers when present, else from autograd's structure. Module and
layer come from sptrace markers, else from autograd's Sequence number links and python stacks.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np
import pandas as pd

from sptrace.detect import forms
from sptrace.detect.args import load_list, present
from sptrace.detect.groups import GroupTable, PeerCandidate
from sptrace.detect.index import RankIndex
from sptrace.detect.intervals import Intervals
from sptrace.load.trace import RankTrace
from sptrace.vocab import collective_kinds, dtypes
from sptrace.vocab.collective_kinds import wire_bytes

COLUMNS = [
    "rank", "kind", "op", "group", "group_size", "group_ranks", "peer", "dtype", "in_elems", "out_elems",
    "in_bytes", "out_bytes", "wire_bytes", "start_us", "dur_us", "transfer_start_us", "transfer_dur_us", "phase",
    "step", "layer", "module", "role", "seq", "source", "unknown", "tid",
]  # fmt: skip
RANK_COLUMNS = [*COLUMNS, "peer_candidates"]
"""A rank's table, before the reduce (resolve_peers) settles the peers only other ranks can name."""
"""start_us / dur_us: the CPU issue span; transfer_*: when the data moved (NCCL kernel, gloo worker)."""

# ---- one collective being assembled ----------------------------------------------------------


@dataclass
class _Row:
    op: str
    kind: str
    start: int
    end: int
    tid: int | None
    event: Any = None
    """The anchor's event row (op, record, kernel or annotation)."""
    rpc: Any = None
    note: Any = None
    inner: Any = None
    """A collective c10d op nested in the anchor (a functional op's c10d call)."""
    gloo: list[Any] = field(default_factory=list)
    kernels: list[Any] = field(default_factory=list)
    external_ids: set[int] = field(default_factory=set)
    anchor: str = "op"  # op | record | annotation | kernel | gloo


def detect_collectives(trace: RankTrace, index: RankIndex | None = None, *, for_reduce: bool = False) -> pd.DataFrame:
    """One row per collective this rank issued (COLUMNS), in issue order. ``index``: the rank's
    RankIndex when the caller has built it already. ``for_reduce``: keep the ``peer_candidates``
    column that ``resolve_peers`` settles once every rank's table is there (RANK_COLUMNS)."""
    idx = index or RankIndex(trace)
    is_anchor = idx.by_name.one_of(forms.all_forms()) | idx.by_name.prefix("symm_mem::")
    anchors = Intervals.of(idx.table, idx.is_cpu & is_anchor)
    rows: list[_Row] = []
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
        row = _Row(name, kind, start, end, tid, event=op)
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
        rows.append(_Row("record_param_comms", kind, start, end, tid, event=rpc, rpc=rpc, note=note, anchor="record"))
    for j in range(len(idx.nccl_annotations)):
        if j in claimed_nccl:
            continue
        note = idx.nccl_annotations.row(j)
        start, end = int(idx.nccl_annotations.start[j]), int(idx.nccl_annotations.end[j])
        tid = int(idx.nccl_annotations.tid[j])
        kind = collective_kinds.by_nccl_annotation()[str(note["name"])]
        rows.append(_Row(str(note["name"]), kind, start, end, tid, event=note, note=note, anchor="annotation"))
    rows.sort(key=lambda r: r.start)
    for row in rows:
        for ev in (row.event, row.rpc, row.note, row.inner):
            if ev is not None and present(ev.get("external_id")):
                row.external_ids.add(int(ev["external_id"]))
    rows += _attach_kernels(idx, rows)
    rows += _attach_gloo(idx, rows)
    rows.sort(key=lambda r: r.start)
    groups = GroupTable(trace)
    records = [_resolve(idx, trace.rank, groups, row) for row in rows]
    frame = pd.DataFrame(records, columns=RANK_COLUMNS)
    return frame if for_reduce else frame.drop(columns=["peer_candidates"])


def _first_collective_record(rpc: Intervals, inside: np.ndarray) -> Any:
    """The record_param_comms of the collective itself (not a nested wait) among those inside."""
    if not len(inside):
        return None
    frames = [rpc.row(int(j)) for j in inside]
    for f in frames:
        if not present(f.get("coll_name")) or collective_kinds.by_record_name().get(str(f["coll_name"])) is not None:
            return f
    return frames[0]


# ---- kernels -----------------------------------------------------------------------------------


def _attach_kernels(idx: RankIndex, rows: list[_Row]) -> list[_Row]:
    """Give each collective the GPU kernels it launched; kernels no CPU collective launched
    (CUDA-graph replays, traces without CPU ops) become rows of their own."""
    if not len(idx.comm_kernels):
        return []
    # (only the launches and flows of these kernels: a GPU trace launches thousands of others)
    launch_at = idx.launched(idx.comm_kernels)  # correlation -> (launch ts, launch tid)
    flow_from = idx.flowed(idx.comm_kernels)  # (kernel ts, stream tid) -> (launch ts, tid)
    by_external: dict[int, _Row] = {}
    for row in rows:
        for e in row.external_ids:
            by_external.setdefault(e, row)
    starts = np.array([r.start for r in rows], dtype=np.int64)
    ends = np.array([r.end for r in rows], dtype=np.int64)
    tids = np.array([-1 if r.tid is None else r.tid for r in rows], dtype=np.int64)
    extra: list[_Row] = []
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
        kind = next(kd for p, kd in collective_kinds.kernel_patterns() if p.search(str(k.name)))
        named = collective_kinds.by_record_name().get(str(k.coll_name)) if present(k.coll_name) else None
        if named:
            kind = named  # RCCL's ncclDevKernel_Generic: the args tell
        row = _Row(str(k.name)[:80], kind, launch[0] if launch else start, launch[0] if launch else end,
                   launch[1] if launch else None, event=k, anchor="kernel")  # fmt: skip
        row.kernels.append(k)
        extra.append(row)
    return extra


# ---- gloo --------------------------------------------------------------------------------------


def _attach_gloo(idx: RankIndex, rows: list[_Row]) -> list[_Row]:
    """Give each collective the gloo worker annotation(s) that carried it out.

    gloo runs a process group's work in the order it was issued, on worker threads (send/recv on
    the calling thread). Annotations are matched first-in, first-out to the collectives of a kind
    they can carry out that were issued before they started, skipping any whose input shapes
    disagree. A list reduce-scatter runs as one all-reduce per output chunk: those extra
    all-reduces join it. Annotations nothing claims (a trace that starts mid-step) become rows."""
    if not len(idx.gloo):
        return []
    extra: list[_Row] = []
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
            row = _Row(str(g.name), kinds[0], ts, end, int(g.tid) if present(g.tid) else None, event=g, anchor="gloo")
            row.gloo.append(g)
            extra.append(row)
            continue
        chosen.gloo.append(g)
        if not _takes_more_gloo(chosen, dims):
            pending.remove(chosen)
    return extra


def _issued_before(rows: list[_Row], ts: int) -> list[_Row]:
    out = []
    for row in rows:  # in issue order
        if row.start > ts:
            break
        out.append(row)
    return out


def _takes_more_gloo(row: _Row, dims: list) -> bool:
    """A list reduce-scatter (c10d::reduce_scatter_) is carried out by one all-reduce per rank."""
    return row.op == "c10d::reduce_scatter_" and bool(dims)


def _dims_agree(row: _Row, dims: list) -> bool:
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


# ---- one row's values ---------------------------------------------------------------------------


class CollectiveRecord(TypedDict):
    """One collective of a rank's table (RANK_COLUMNS), as ``_resolve`` reads it off its row:
    a TypedDict, as the table is made of these records."""

    rank: int | None
    kind: str
    op: str
    group: str | None
    group_size: int | None
    group_ranks: list[int] | None
    peer: int | None
    dtype: str | None
    in_elems: int | None
    out_elems: int | None
    in_bytes: int | None
    out_bytes: int | None
    wire_bytes: float | None
    start_us: float
    dur_us: float
    transfer_start_us: float | None
    transfer_dur_us: float | None
    phase: str | None
    step: int | None
    layer: int | None
    module: str | None
    role: str | None
    seq: int | None
    source: str
    unknown: str | None
    tid: int | None
    peer_candidates: list[PeerCandidate] | None


def _resolve(idx: RankIndex, rank: int | None, groups: GroupTable, row: _Row) -> CollectiveRecord:
    source: list[str] = []
    unknown: list[str] = []
    sizes = forms.Sizes()
    group_name: str | None = None
    group_size: int | None = None
    group_ranks: list | None = None
    seq = None
    peer = None
    rpc = row.rpc
    # 1. record_param_comms args (NCCL); the kernel's copied args for a kernel-only row
    args_event = rpc if rpc is not None and present(rpc.get("coll_name")) else None
    if args_event is None and row.anchor == "kernel" and present(getattr(row.event, "coll_name", None)):
        args_event = row.event._asdict()
    if args_event is not None:
        got = forms.sizes_from_record(args_event)
        if got.in_elems is not None:
            sizes = got
            source.append("bytes: record_param_comms args" if row.anchor != "kernel" else "bytes: kernel args")
        if present(args_event.get("pg_name")):
            group_name = str(args_event["pg_name"])
        if present(args_event.get("group_size")):
            group_size = int(args_event["group_size"])
        if present(args_event.get("pg_ranks")):
            try:
                parsed = json.loads(str(args_event["pg_ranks"]))
                group_ranks = parsed if isinstance(parsed, list) and parsed else None
            except ValueError:
                pass
        if present(args_event.get("comm_seq")):
            seq = int(args_event["comm_seq"])
        if row.kind in ("send", "recv") and present(args_event.get("comm_rank")):
            peer = int(args_event["comm_rank"])
        if group_name is not None or group_size is not None:
            source.append("group: record_param_comms args")
    # 2. the op's own signature (c10d, functional), and a c10d op nested in a functional one
    op_sizes = forms.sizes_from_op(row.op, row.event) if row.anchor == "op" else forms.Sizes()
    if row.inner is not None:
        op_sizes = op_sizes.merge(forms.sizes_from_op(str(row.inner["name"]), row.inner))
    if op_sizes.group_size is not None and group_size is None:
        group_size = op_sizes.group_size
        source.append(f"group size: {row.op} arguments")
    if peer is None and op_sizes.peer is not None:
        peer = op_sizes.peer
    if sizes.in_elems is None and (op_sizes.in_elems is not None or op_sizes.out_elems is not None):
        sizes = op_sizes
        source.append(f"bytes: {'c10d' if row.op.startswith('c10d') else 'op'} Input Dims")
    elif sizes.dtype is None and op_sizes.dtype is not None:
        sizes = sizes.merge(op_sizes)
    # 3. older NCCL traces: the nccl:* annotation's Input Dims
    if sizes.in_elems is None and sizes.out_elems is None and row.note is not None:
        got = forms.sizes_from_annotation(row.kind, row.note)
        if got.in_elems is not None:
            sizes = sizes.merge(got)
            source.append("bytes: nccl annotation Input Dims")
    # 4. gloo: the worker annotation knows the element type of TensorList ops, and a root
    # scatter's (or list all-to-all's) input: one tensor per member of the group
    if row.gloo:
        got = forms.sizes_from_annotation(row.kind, row.gloo[0]._asdict())
        if sizes.in_elems is None and got.in_elems is not None:
            sizes = dataclasses.replace(sizes, in_elems=got.in_elems, why_in=None).merge(got)
            source.append("bytes: gloo annotation Input Dims")
        if sizes.dtype is None and got.dtype is not None:
            sizes = dataclasses.replace(sizes, dtype=got.dtype)
            source.append("dtype: gloo annotation")
        if group_size is None and got.group_size is not None:
            group_size = got.group_size
            source.append("group size: gloo annotation (one tensor per member)")
    # the marker of a collective issued by sptrace's reference models names its dtype and group
    # size (role|dtype=...|group=...): what a TensorList op or an unnamed group leaves unsaid
    module, role, how = idx.module_of(row.start, row.end, row.tid if row.tid is not None else -1)
    if role and "|" in role:
        role, *fields = role.split("|")
        meta = dict(f.partition("=")[::2] for f in fields)
        marker_dtype, marker_group = meta.get("dtype", ""), meta.get("group", "")
        if sizes.dtype is None and dtypes.canonical(marker_dtype):
            sizes = sizes.merge(forms.Sizes(dtype=marker_dtype))
            source.append("dtype: sptrace.comm marker")
        if group_size is None and marker_group.isdigit():
            group_size = int(marker_group)
            source.append("group size: sptrace.comm marker")
    # 5. the group: named by the op, else this rank's process groups, else the out/in ratio
    group_name, size2, ranks2, how_group = groups.resolve(group_name, group_size)
    group_size = group_size or size2
    group_ranks = group_ranks or ranks2
    if how_group:
        source.append(f"group: {how_group}")
    if group_size is None:
        ratio = sizes.ratio_group_size(row.kind)
        if ratio is not None:
            group_size = ratio
            source.append("group size: out/in ratio")
    if group_size is None and row.kind not in ("send", "recv"):
        unknown.append("group size: the trace records no process group for it")
    sizes = sizes.complete(row.kind, group_size)
    elem = dtypes.element_size(sizes.dtype)
    if sizes.dtype is None:
        unknown.append("dtype: not recorded (a TensorList op without a worker annotation)")
    elif elem is None:
        unknown.append(f"element size of dtype {sizes.dtype!r}")
    in_bytes = sizes.in_elems * elem if sizes.in_elems is not None and elem else None
    out_bytes = sizes.out_elems * elem if sizes.out_elems is not None and elem else None
    if sizes.in_elems is None:
        unknown.append(f"in bytes: {sizes.why_in or 'no sizes recorded'}")
    if sizes.out_elems is None:
        unknown.append(f"out bytes: {sizes.why_out or 'no sizes recorded'}")
    candidates = None
    if peer is not None and group_ranks and 0 <= peer < len(group_ranks):
        peer = int(group_ranks[peer])  # the op names the peer by its rank in the group
    elif peer is not None and row.kind in ("send", "recv"):
        # the group is unnamed (c10d::send records none): the peer's rank in which group?
        options = groups.peer_candidates(peer)
        if len({o["peer"] for o in options}) == 1:
            peer = options[0]["peer"]
            if len(options) == 1:
                group_name, group_size, group_ranks = options[0]["group"], options[0]["size"], options[0]["ranks"]
        elif options:
            unknown.append(f"peer: rank {peer} of a process group the trace does not name ({len(options)} fit)")
            candidates, peer = options, None  # resolve_peers decides from the partners' traces
    wire = None
    if row.kind in ("barrier",):
        wire = 0.0
    elif row.kind in ("send", "recv") and in_bytes is not None:
        wire = wire_bytes(row.kind, in_bytes, out_bytes or in_bytes, 2)
    elif in_bytes is not None and out_bytes is not None and group_size is not None:
        wire = wire_bytes(row.kind, in_bytes, out_bytes, group_size)
    transfer = _transfer_span(row)
    if transfer is None and row.anchor == "op":
        unknown.append("transfer time: no NCCL kernel or gloo annotation linked to it")
    if row.kernels:
        source.append(f"transfer: {len(row.kernels)} GPU kernel{'s' if len(row.kernels) > 1 else ''}")
    elif row.gloo:
        source.append("transfer: gloo worker annotation")
    if row.anchor == "kernel":
        source.insert(0, "kernel only: no CPU op launched it")
    elif row.anchor == "gloo":
        source.insert(0, "gloo annotation only: no c10d op in the trace")
    source.append(f"module: {how}")
    dtype_name = dtypes.canonical(sizes.dtype) or sizes.dtype
    return {
        "rank": rank, "kind": row.kind, "op": row.op, "group": group_name, "group_size": group_size,
        "group_ranks": group_ranks, "peer": peer, "dtype": dtype_name, "in_elems": sizes.in_elems,
        "out_elems": sizes.out_elems, "in_bytes": in_bytes, "out_bytes": out_bytes,
        "wire_bytes": wire, "start_us": row.start / 1000, "dur_us": (row.end - row.start) / 1000,
        "transfer_start_us": None if transfer is None else transfer[0] / 1000,
        "transfer_dur_us": None if transfer is None else (transfer[1] - transfer[0]) / 1000,
        "phase": idx.phase_of(row.start, row.end, row.tid if row.tid is not None else -1),
        "step": idx.step_of(row.start), "layer": idx.layer_of(module), "module": module, "role": role, "seq": seq,
        "source": "; ".join(source), "unknown": "; ".join(unknown) or None, "tid": row.tid,
        "peer_candidates": candidates,
    }  # fmt: skip


def _transfer_span(row: _Row) -> tuple[int, int] | None:
    parts = row.kernels or row.gloo
    if not parts:
        return None
    starts = [int(p.ts_ns) for p in parts]
    ends = [int(p.ts_ns) + (int(p.dur_ns) if present(p.dur_ns) else 0) for p in parts]
    return min(starts), max(ends)
